"""CLI subcommands contributed by other parts of the package (NAME, HELP, add_arguments, run)."""
