"""`deathwatch wait` and `deathwatch explain`: a platform's commands on verdicts, on top of
the public `deathwatch.client`."""
