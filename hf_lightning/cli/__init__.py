"""The command-line entry points' process: the warnings they hide and the lines they print."""
