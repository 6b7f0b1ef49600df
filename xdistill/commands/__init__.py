"""Thin CLI entry modules: one per ``xdistill`` subcommand, each with ``main(argv) -> int``."""
