"""Near-duplicate search over plain arrays: the package's API.

    from transforms.near import NearSpec, find_near, exact_distance
    r = find_near(x, rank, NearSpec("cosine", 0.01))     # removals, in keep order

What each module holds (the Beam steps in pipeline/steps/near*.py run the same pieces on
workers):

- ``spec``: ``NearSpec``, the settings (metric, tolerance, grouping, cells, mode).
- ``verify``: the exact distance in float64, which every removal rests on.
- ``search``: float32 search vectors with a proven per-row rounding bound; ``space``:
  each metric's search space and radius.
- ``plan``: k-means cells and the exact or bounded assignment of rows to them;
  ``project``: the projected prefilter.
- ``greedy``: a cell's decisions in keep order against the rows kept so far;
  ``components``: connected components of verified pairs.
- ``recall``: the brute-force sample that measures recall; ``nearest``: sampled
  nearest-neighbour distances for the report.
- ``find``: all of it in one process (``find_near``, ``near_duplicates``).
"""

from transforms.near.find import NearResult, find_near, measure_recall, near_duplicates
from transforms.near.spec import METRICS, NearSpec
from transforms.near.verify import exact_distance

__all__ = ["METRICS", "NearResult", "NearSpec", "exact_distance", "find_near",
           "measure_recall", "near_duplicates"]
