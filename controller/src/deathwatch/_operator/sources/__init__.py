"""What comes into the controller: one reflector per collection, for ever (`reflector`), the
collections it reads (`watched`), the receivers that hand each decoded object to its pass
(`receivers`), a new DeathWatch's pods listed (`adoption`), the coverage Leases and the probe read
on a period (`reads`), the nodes' exits, each with its pod read (`exits`), and how fresh each
stream is, for /readyz (`readiness`)."""
