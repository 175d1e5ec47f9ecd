"""Unit tests of the Python SDK: run from the repository root with
`/usr/bin/python3 -m unittest discover -s sdk/python/tests -t sdk/python` (make test)."""
