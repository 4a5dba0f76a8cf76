// Apache Iceberg's REST catalog, as Iceberg's own tests serve it (RESTCatalogAdapter and
// RESTCatalogServlet from iceberg-core's tests jar, jvm/rest/pom.xml), in front of a JDBC catalog
// in SQLite: for tests/spark/test_iceberg.py's REST catalog test. Unlike Iceberg's
// RESTCatalogServer it listens on 127.0.0.1 only, on a port the system picks, and prints that
// port on its first line of stdout.
//
//   java -cp 'jvm/rest/jars/*' tests/spark/IcebergRestServer.java WAREHOUSE_URI SQLITE_FILE
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class IcebergRestServer {
  public static void main(String[] args) throws Exception {
    Map<String, String> props = Map.of(
        "catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog",
        "uri", "jdbc:sqlite:" + args[1],
        "jdbc.schema-version", "V1",
        "warehouse", args[0]);
    Catalog catalog = CatalogUtil.buildIcebergCatalog("rest_backend", props, new Configuration());
    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost("127.0.0.1");
    connector.setPort(0);
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    System.out.println(connector.getLocalPort());
    System.out.flush();
    server.join();
  }
}
