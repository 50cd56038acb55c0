from execbox.cli import main

main()
