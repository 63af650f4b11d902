"""The verdict's rules (coordinator process), one module each: `verdict.py` lists them in
docs/design.md's priority order, and each returns its Verdict with its summary."""
