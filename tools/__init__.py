"""Developer tools: fixture generators, calibrations and self-checks, run from the repo root as `python -m tools.NAME`."""
