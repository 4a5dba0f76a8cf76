from pgrecv.cli.main import main

main()
