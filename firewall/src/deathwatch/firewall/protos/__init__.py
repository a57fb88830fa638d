"""protoc's output for the subsets of the CRI and of containerd's API the exit observer reads
(firewall/protos/*.proto; hack/gen_protos.sh regenerates, a unit test checks it is current)."""
