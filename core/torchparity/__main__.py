from torchparity.cli import main

main()
