"""What the repository promises a reader of its code: it stands alone, so the
product cites its own docs/ and never a specification the repository does not
hold. Red when a citation of the old "SPEC §" comes back (checked once by
planting one in certflow/errors.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [*(ROOT / "certflow").rglob("*.py"), *(ROOT / "workflows").rglob("*.py"),
           *(ROOT / "activities").rglob("*.py"), ROOT / "worker.py", ROOT / "starter.py"]


def test_the_product_cites_no_spec_it_does_not_hold() -> None:
    marker = "SPEC " + "§"
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in PRODUCT
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line
    ]
    assert found == []
