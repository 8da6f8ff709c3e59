"""Checks /app/total.txt and /app/by_region.csv against the sales in /app/sales.csv."""

import csv
from pathlib import Path

import pytest

APP = Path("/app")
EXPECTED_BY_REGION = [("east", "24.99"), ("north", "15.60"), ("south", "7.40")]


def test_total_file_exists():
    assert (APP / "total.txt").is_file()


def test_total_value():
    assert (APP / "total.txt").read_text() == "47.99\n"


def test_by_region_header():
    rows = list(csv.reader((APP / "by_region.csv").open(newline="")))
    assert rows[0] == ["region", "total"]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_by_region_rows(index):
    rows = list(csv.reader((APP / "by_region.csv").open(newline="")))[1:]
    assert len(rows) == len(EXPECTED_BY_REGION)
    assert tuple(rows[index]) == EXPECTED_BY_REGION[index]


def test_input_untouched():
    lines = (APP / "sales.csv").read_text().splitlines()
    assert lines[0] == "region,item,amount" and len(lines) == 7
