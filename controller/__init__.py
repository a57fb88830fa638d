"""deathwatch controller: the verdict engine, its policies, replay, and the kopf operator."""
