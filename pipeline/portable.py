"""``python -m pipeline.portable jobs|pool``: a Beam job service or worker pool for
``runner.name: portable`` (``pipeline.runners.portable``, where they are)."""

if __name__ == "__main__":
    from pipeline.runners.portable import main

    main()
