"""`make gpu-check`: one command that proves the suite's CUDA path and measures it (see __main__.py)."""
