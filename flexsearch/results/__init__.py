"""What a run yields and how it is read: the robustness score (`metrics`, `differences`, `verdict`), the split
(`split`, `diversity`), the run directory (`run_dir`, `run_readme`), the reports a person reads (`printing`,
`report`, `weak_spots`, `comparison`) and the files other tools read (`export`).

The typed results the Python API returns (`RunResult`, `Score`, `Rate`, `Difference`, `Comparison`) are
defined in `run_result.py` and importable from here.
"""

from flexsearch.results.run_result import Comparison, Difference, Rate, RunResult, Score

__all__ = ["Comparison", "Difference", "Rate", "RunResult", "Score"]
