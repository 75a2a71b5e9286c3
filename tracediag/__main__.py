from tracediag.cli import main

main()
