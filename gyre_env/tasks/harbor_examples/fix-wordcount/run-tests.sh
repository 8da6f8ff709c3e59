#!/bin/bash
# terminal-bench's test runner: install pytest, run the tests in $TEST_DIR.
pip install pytest==8.2.0
pytest $TEST_DIR/test_outputs.py -rA
