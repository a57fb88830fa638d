"""The controller's two ports (ADR 0020): `/metrics` and `/readyz` behind TokenReview and
SubjectAccessReview, `/healthz` and `/readyz` for the kubelet (`endpoints`); what `/readyz`
says is the sources' (`sources.readiness`)."""
