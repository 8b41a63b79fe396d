"""The report a run writes: its tables and summary.json (``tables``), the near stage's
histogram and borderline pairs (``near``), the page (``pick`` chooses what it shows,
``html`` draws it) and ``RunSummary`` (``summary``), what a run returns."""
