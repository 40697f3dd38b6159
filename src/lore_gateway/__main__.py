from lore_gateway.cli.main import main

main()
