"""The crash harness (issue 23, "A crash at every commit"; docs/reliability.md).

``harness`` runs a scenario against a real ``turnstile serve`` crashed at one commit point by
the store's fault seam (``runtime/store/faults.py``), restarts it, finishes and checks;
``invariants`` says what must hold; ``scenarios`` are what is run; ``runner`` (``python -m
tests.crash``) runs every point or a seeded sample and prints the table.
"""
