import sys

from preprocess.cli import main

if __name__ == "__main__":  # the guard lets Beam's multi-processing and Dask workers import this safely
    sys.exit(main())
