"""deathwatch firewall: the node agent that owns the nftables table `inet deathwatch`."""
