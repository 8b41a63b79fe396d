"""``python -m pipeline.processes``: a local worker process, as the local runner starts
them (``pipeline.runners.local``, where the worker is)."""

if __name__ == "__main__":
    from pipeline.stopping import ends_with_launcher

    ends_with_launcher()  # first: the imports below take seconds on a busy machine
    from pipeline.runners.local import main

    main()
