// Runs Flink SQL for tests/output/test_flink.py on a local MiniCluster and prints what it gets as JSON lines.
// Input (a file): statements separated by lines holding only ";". A statement starting with
// "-- query NAME" is a query: its rows are printed as {"query": NAME, "kind": "+I", "row": [...]}.
// A failing query prints {"query": NAME, "error": "<messages of the cause chain>"} and the run goes on.
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.Map;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.types.Row;
import org.apache.flink.util.CloseableIterator;

public class Replay {
    public static void main(String[] args) throws Exception {
        String script = Files.readString(Path.of(args[0]));
        TableEnvironment env = TableEnvironment.create(EnvironmentSettings.inStreamingMode());
        env.getConfig().set("parallelism.default", "1");
        env.getConfig().set("table.local-time-zone", "UTC");
        for (String stmt : script.split("\n;\n")) {
            stmt = stmt.strip();
            if (stmt.isEmpty()) continue;
            if (!stmt.startsWith("-- query ")) {
                env.executeSql(stmt);
                continue;
            }
            String name = stmt.substring(9, stmt.indexOf('\n')).strip();
            StringBuilder out = new StringBuilder();
            try {
                TableResult result = env.executeSql(stmt.substring(stmt.indexOf('\n') + 1));
                try (CloseableIterator<Row> it = result.collect()) {
                    while (it.hasNext()) {
                        Row row = it.next();
                        out.append("{\"query\":").append(str(name)).append(",\"kind\":")
                           .append(str(row.getKind().shortString())).append(",\"row\":[");
                        for (int i = 0; i < row.getArity(); i++) {
                            if (i > 0) out.append(',');
                            out.append(json(row.getField(i)));
                        }
                        out.append("]}\n");
                    }
                }
            } catch (Exception exc) {
                StringBuilder msg = new StringBuilder();
                for (Throwable t = exc; t != null; t = t.getCause()) msg.append(t.getMessage()).append(" | ");
                out.append("{\"query\":").append(str(name)).append(",\"error\":").append(str(msg.toString())).append("}\n");
            }
            System.out.print(out);
            System.out.flush();
        }
        System.exit(0);
    }

    static String json(Object v) {
        if (v == null) return "null";
        if (v instanceof Boolean || v instanceof Integer || v instanceof Long || v instanceof Short
                || v instanceof Byte) return v.toString();
        if (v instanceof java.math.BigDecimal d) return str(d.toPlainString());
        if (v instanceof byte[] b) return str(Base64.getEncoder().encodeToString(b));
        if (v instanceof Object[] a) {
            StringBuilder s = new StringBuilder("[");
            for (int i = 0; i < a.length; i++) { if (i > 0) s.append(','); s.append(json(a[i])); }
            return s.append(']').toString();
        }
        if (v instanceof Map<?, ?> m) {
            StringBuilder s = new StringBuilder("{");
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!first) s.append(',');
                first = false;
                s.append(str(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return s.append('}').toString();
        }
        return str(v.toString());  // strings, floats, dates and times (ISO text)
    }

    static String str(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }
}
