"""The command line: Click commands that parse options and wire the stages together."""
