from conveyor.cli.main import main

main()
