from conveyor.cli.main import main

# The guard matters: guarded stages start child processes with "spawn",
# which imports the parent's main module again.
if __name__ == "__main__":
    main()
