"""Write the feature table sample: ``data/features/cancer.csv``, scikit-learn's breast
cancer table (569 real rows of 30 measurements and the diagnosis) as pandas writes a
DataFrame to CSV, with planted copies a user would meet: 12 rows entered twice, 8 rows
measured again with the last digit changed (each feature moved by at most 0.1% of its
value), and 3 rows whose measurements are missing (empty cells). ``data/features/
EXPECTED.json`` holds what the shipped config removes.

    python scripts/make_feature_sample.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "features"


def main() -> None:
    data = load_breast_cancer(as_frame=True)
    df = data.frame.rename(columns=lambda c: c.replace(" ", "_"))
    df.insert(0, "patient", [f"p{i:04d}" for i in range(len(df))])
    rng = np.random.default_rng(7)
    twice = df.iloc[rng.choice(len(df), 12, replace=False)].copy()
    twice["patient"] = [f"{p}-again" for p in twice["patient"]]
    again = df.iloc[rng.choice(len(df), 8, replace=False)].copy()
    features = [c for c in df.columns if c not in ("patient", "target")]
    again[features] = (again[features] * (1 + rng.uniform(-1e-3, 1e-3, (8, len(features))))
                       ).round(6)
    again["patient"] = [f"{p}-remeasured" for p in again["patient"]]
    missing = df.iloc[rng.choice(len(df), 3, replace=False)].copy()
    missing["mean_radius"] = np.nan
    missing["patient"] = [f"{p}-incomplete" for p in missing["patient"]]
    out = pd.concat([df, twice, again, missing], ignore_index=True)
    out = out.iloc[rng.permutation(len(out))]
    OUT.mkdir(parents=True, exist_ok=True)
    out.to_csv(OUT / "cancer.csv", index=False)
    (OUT / "EXPECTED.json").write_text(json.dumps(
        {"read": len(out), "removed_exact": 12, "removed_near": 8, "invalid": 3}, indent=1)
        + "\n")
    print(f"wrote {OUT / 'cancer.csv'} ({len(out)} rows)")


if __name__ == "__main__":
    main()
