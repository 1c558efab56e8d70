"""The ``dlrover`` command line: one module per group of subcommands."""
