"""`deathwatch replay`: what each policy would have said about a recorded watch stream."""
