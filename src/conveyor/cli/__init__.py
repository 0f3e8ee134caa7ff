"""The command line: Typer commands and Rich rendering."""
