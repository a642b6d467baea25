"""Benchmarks, run from the repo root as `python -m bench.NAME`; their results and history are in bench/RESULTS.md."""
