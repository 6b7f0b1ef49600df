"""Demos run by ``make demo`` / ``xdistill demo``."""
