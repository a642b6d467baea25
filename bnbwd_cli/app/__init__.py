"""The use cases, one module each, below the two faces (cli/ and api.py) and above the parts they use.

inputs (named arrays and settings -> a checked Op), run (read, compute once, write), judge (a kernel's
outputs against bnbwd's or a reference file's), check (a suite of case files), streaming (out-of-core
runs). No click, no printing: a problem with the input is an InputError, progress goes through a
callback the caller passes, and the verdicts are status.Status.
"""
