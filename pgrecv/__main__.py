from pgrecv.cli import main

main()
