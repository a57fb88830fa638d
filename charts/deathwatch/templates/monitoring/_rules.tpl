{{/*
deathwatch's alerting rules, as Prometheus rule groups: the PrometheusRule (prometheusrule.yaml)
and the plain file monitoring/deathwatch.rules.yaml (hack/render_manifests.py) both come from
here. Each alert's runbook is a section of docs/runbook.md.

Every expression is this release's alone, whatever else the Prometheus scrapes: its series are
picked by exact matchers (the job, i.e. the metrics Service's name, and the namespace: what
the chart's ServiceMonitor and PodMonitor give; prometheusRule.selectors for a scrape of your
own), and its alerts carry `namespace` and `job` to say whose they are. Leadership and counting
are per shard (controller.shards, ADR 0025): each shard's Lease has one leader, and both
replicas of a shard judge its sandboxes, so a counter they both keep is taken once per shard
(max over the shard's replicas) and summed over the shards. A replica's shard is the `shard`
label of its deathwatch_shard_owned_slots ("0" for the only one): `$shard` joins it on.
*/}}
{{- define "deathwatch.rules" -}}
{{- $r := .Values.prometheusRule -}}
{{- $for := $r.for -}}
{{- $runbook := $r.runbookUrl | default (printf "https://github.com/deathwatch-dev/deathwatch/blob/v%s/docs/runbook.md" .Chart.AppVersion) -}}
{{- $fullname := include "deathwatch.fullname" . -}}
{{- $namespace := include "deathwatch.namespace" . -}}
{{- range $old := list "controllerJob" "firewallJob" }}
{{- if hasKey $r $old }}
{{- fail (printf "prometheusRule.%s: replaced by prometheusRule.selectors (exact matchers: a regex job also matched other releases' targets); the chart's monitors need neither" $old) }}
{{- end }}
{{- end }}
{{- $C := $r.selectors.controller | default (printf "job=%q, namespace=%q" (printf "%s-controller-metrics" $fullname) $namespace) -}}
{{- $F := $r.selectors.firewall | default (printf "job=%q, namespace=%q" (printf "%s-firewall-metrics" $fullname) $namespace) -}}
{{- $shard := printf "on (instance) group_left (shard) group by (instance, shard) (deathwatch_shard_owned_slots{%s})" $C -}}
groups:
  - name: deathwatch.controller
    rules:
      - alert: DeathwatchControllerDown
        # its targets known and all down: it says whose (namespace, job); none known at all
        # (the Deployment gone, or not scraped): absent() says it, without them
        expr: >-
          max by (namespace, job) (up{ {{- $C -}} }) == 0
          or on () absent(up{ {{- $C -}} } == 1)
        for: {{ $for.controllerDown }}
        labels: {severity: critical}
        annotations:
          summary: No deathwatch controller replica is up
          description: >-
            No controller target has answered a scrape for {{ $for.controllerDown }}: sandbox
            deaths are not being judged, and nobody acting on verdicts learns of them.
          runbook_url: {{ $runbook }}#deathwatchcontrollerdown
      - alert: DeathwatchNoLeader
        expr: >-
          sum by (namespace, job, shard) (deathwatch_leader{ {{- $C -}} } * {{ $shard }}) < 1
        for: {{ $for.noLeader }}
        labels: {severity: critical}
        annotations:
          summary: deathwatch controllers are up but none holds the Lease
          description: >-
            The controller replicas of shard {{`{{ $labels.shard }}`}} answer, but none has
            written for {{ $for.noLeader }}: verdicts are judged and held, not published.
          runbook_url: {{ $runbook }}#deathwatchnoleader
      - alert: DeathwatchReleaseCollision
        # another release shares what this one holds: its controller id over namespaces both
        # serve, its firewall's table or a host port. The chart refuses it at install with
        # lookup, which nothing runs under helm template; applied anyway, the release applied
        # later gives way (yields="true") and both say so, naming the other (ADR 0038)
        expr: >-
          max by (namespace, job, what, other, yields)
          (deathwatch_release_collisions{ {{- $C -}} }) > 0
          or max by (namespace, job, what, other, yields)
          (deathwatch_firewall_release_collisions{ {{- $F -}} }) > 0
        for: {{ $for.releaseCollision }}
        labels: {severity: warning}
        annotations:
          summary: Another deathwatch release shares what this one holds
          description: >-
            This release shares its {{`{{ $labels.what }}`}} with release
            {{`{{ $labels.other }}`}}{{`{{ if eq $labels.yields "true" }}`}}, applied first:
            this release gives way (its controller does not lead, or its agents leave the
            table alone){{`{{ else }}`}}, applied later, which gives way{{`{{ end }}`}}.
          runbook_url: {{ $runbook }}#deathwatchreleasecollision
      - alert: DeathwatchSplitLeadership
        expr: >-
          sum by (namespace, job, shard) (deathwatch_leader{ {{- $C -}} } * {{ $shard }}) > 1
        for: {{ $for.noLeader }}
        labels: {severity: critical}
        annotations:
          summary: More than one deathwatch replica says it leads
          description: >-
            {{`{{ $value }}`}} replicas of shard {{`{{ $labels.shard }}`}} report
            deathwatch_leader 1 for {{ $for.noLeader }}.
          runbook_url: {{ $runbook }}#deathwatchsplitleadership
      - alert: DeathwatchWatchStale
        expr: >-
          time() - max by (namespace, job, instance, resource)
          (deathwatch_watch_stream_activity_timestamp_seconds{ {{- $C -}}, resource="pods"})
          > {{ $r.watchStaleSeconds }}
        for: {{ $for.watchStale }}
        labels: {severity: warning}
        annotations:
          summary: A deathwatch replica's pod watch delivered nothing for over {{ $r.watchStaleSeconds }} s
          description: >-
            {{`{{ $labels.instance }}`}} has had nothing from its pod watch, not even a
            bookmark, for {{`{{ $value | humanizeDuration }}`}}: verdicts may be late.
          runbook_url: {{ $runbook }}#deathwatchwatchstale
      - alert: DeathwatchWatchNotOpen
        expr: max by (namespace, job, instance, resource, scope) (deathwatch_watch_not_open{ {{- $C -}} }) == 1
        for: {{ $for.watchNotOpen }}
        labels: {severity: critical}
        annotations:
          summary: A deathwatch replica cannot open one of its watches
          description: >-
            {{`{{ $labels.instance }}`}} has not listed {{`{{ $labels.resource }}`}} in
            {{`{{ if $labels.scope }}{{ $labels.scope }}{{ else }}all namespaces{{ end }}`}}
            since it started: its start-up waits, and it judges nothing there. /readyz
            names the watch and its last error.
          runbook_url: {{ $runbook }}#deathwatchwatchnotopen
      - alert: DeathwatchTaskCrashLooping
        expr: increase(deathwatch_task_restarts_total{ {{- $C -}} }[10m]) > 3
        for: {{ $for.taskCrashLooping }}
        labels: {severity: warning}
        annotations:
          summary: A deathwatch task keeps crashing
          description: >-
            Task {{`{{ $labels.task }}`}} on {{`{{ $labels.instance }}`}} was restarted
            {{`{{ $value | printf "%.0f" }}`}} times in 10 minutes.
          runbook_url: {{ $runbook }}#deathwatchtaskcrashlooping
      - alert: DeathwatchAPIErrors
        expr: >-
          sum by (namespace, job, instance, operation, code)
          (rate(deathwatch_api_errors_total{ {{- $C -}}, code!~"404|409"}[5m])) > 0.05
        for: {{ $for.apiErrors }}
        labels: {severity: warning}
        annotations:
          summary: deathwatch's API calls keep failing
          description: >-
            {{`{{ $labels.operation }}`}} fails with {{`{{ $labels.code }}`}} on
            {{`{{ $labels.instance }}`}} ({{`{{ $value | printf "%.2f" }}`}}/s).
          runbook_url: {{ $runbook }}#deathwatchapierrors
      - alert: DeathwatchPolicyErrors
        expr: max by (namespace, job, policy) (increase(deathwatch_policy_errors_total{ {{- $C -}} }[1m])) > 0
        for: {{ $for.policyErrors }}
        labels: {severity: warning}
        annotations:
          summary: A death policy keeps failing
          description: >-
            Policy {{`{{ $labels.policy }}`}} has raised, returned garbage or hung in every
            minute for {{ $for.policyErrors }} ({{`{{ $value | printf "%.0f" }}`}} in the last);
            its pods are judged by container-state meanwhile (Dead only on a terminated or
            restarted container).
          runbook_url: {{ $runbook }}#deathwatchpolicyerrors
      - alert: DeathwatchWritesRefused
        expr: max by (namespace, job, resource, code) (increase(deathwatch_writes_refused_total{ {{- $C -}} }[15m])) > 0
        for: {{ $for.writesRefused }}
        labels: {severity: warning}
        annotations:
          summary: The API refuses some of deathwatch's writes for good
          description: >-
            The API refused {{`{{ $value | printf "%.0f" }}`}} writes of
            {{`{{ $labels.resource }}`}} ({{`{{ $labels.code }}`}}) in 15 minutes; each is logged
            once with the reason.
          runbook_url: {{ $runbook }}#deathwatchwritesrefused
      - alert: DeathwatchWritesRetrying
        expr: sum by (namespace, job, instance, resource) (rate(deathwatch_write_retries_total{ {{- $C -}} }[5m])) > 0
        for: {{ $for.writesRetrying }}
        labels: {severity: warning}
        annotations:
          summary: Some of deathwatch's writes keep failing and are retried
          description: >-
            {{`{{ $labels.instance }}`}} has retried writes of {{`{{ $labels.resource }}`}}
            without pause for {{ $for.writesRetrying }}: verdicts wait (kept, not lost) until
            the API takes them.
          runbook_url: {{ $runbook }}#deathwatchwritesretrying
      - alert: DeathwatchVerdictLatencyHigh
        expr: >-
          histogram_quantile(0.99, sum by (namespace, job, le)
          (rate(deathwatch_verdict_latency_seconds_bucket{ {{- $C -}} }[10m]))) > {{ $r.verdictLatencySeconds }}
        for: {{ $for.verdictLatency }}
        labels: {severity: warning}
        annotations:
          summary: Dead verdicts take more than {{ $r.verdictLatencySeconds }} s (p99)
          description: >-
            From a sandbox's Ready drop to its Dead verdict, p99 {{`{{ $value | humanizeDuration }}`}}.
          runbook_url: {{ $runbook }}#deathwatchverdictlatencyhigh
  - name: deathwatch.sandboxes
    rules:
      - alert: DeathwatchNodeDeathBurst
        expr: >-
          sum by (namespace, job, node) (max by (namespace, job, shard, node) (
          sum by (namespace, job, instance, node) (increase(deathwatch_sandbox_deaths_total{ {{- $C -}} }[5m]))
          * {{ $shard }})) > {{ $r.deathBurst.perNode }}
        for: {{ $for.deathBurst }}
        labels: {severity: critical}
        annotations:
          summary: Many sandboxes died on one node
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} sandboxes on node {{`{{ $labels.node }}`}} were
            declared Dead in 5 minutes: the node or its runtime may be failing.
          runbook_url: {{ $runbook }}#deathwatchnodedeathburst
      - alert: DeathwatchDeathBurst
        expr: >-
          sum by (namespace, job) (max by (namespace, job, shard) (
          sum by (namespace, job, instance) (increase(deathwatch_sandbox_deaths_total{ {{- $C -}} }[5m]))
          * {{ $shard }})) > {{ $r.deathBurst.cluster }}
        for: {{ $for.deathBurst }}
        labels: {severity: critical}
        annotations:
          summary: Many sandboxes died across the cluster
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} sandboxes were declared Dead in 5 minutes.
          runbook_url: {{ $runbook }}#deathwatchdeathburst
      - alert: DeathwatchInfrastructureDeathBurst
        expr: >-
          sum by (namespace, job, cause) (max by (namespace, job, shard, cause) (
          sum by (namespace, job, instance, cause) (increase(deathwatch_sandbox_deaths_total{ {{- $C -}}, origin="Infrastructure"}[10m]))
          * {{ $shard }})) > {{ $r.deathBurst.infrastructure }}
        for: {{ $for.deathBurst }}
        labels: {severity: warning}
        annotations:
          summary: The cluster is taking sandboxes away
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} sandboxes were declared Dead ({{`{{ $labels.cause }}`}})
            by the infrastructure's doing in 10 minutes: drains, preemptions, taint
            evictions, nodes lost, deleted, shut down or under pressure. Their users did
            nothing wrong.
          runbook_url: {{ $runbook }}#deathwatchinfrastructuredeathburst
      - alert: DeathwatchUncoveredNode
        expr: >-
          sum by (namespace, job, node) (max by (namespace, job, shard, node) (
          deathwatch_node_sandboxes{ {{- $C -}}, shielded="False"} * {{ $shard }})) > 0
        for: {{ $for.uncoveredNodes }}
        labels: {severity: critical}
        annotations:
          summary: A node runs sandboxes without a current firewall agent
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} live sandboxes on node {{`{{ $labels.node }}`}}
            are not shielded: anything on that node can reach their agent ports.
          runbook_url: {{ $runbook }}#deathwatchuncoverednode
  - name: deathwatch.firewall
    rules:
      - alert: DeathwatchFirewallAgentDown
        expr: up{ {{- $F -}} } == 0
        for: {{ $for.firewallDown }}
        labels: {severity: warning}
        annotations:
          summary: A firewall agent does not answer
          description: >-
            The firewall agent {{`{{ $labels.instance }}`}} has not answered a scrape for
            {{ $for.firewallDown }} (its rule stays in force; its coverage Lease will go stale).
          runbook_url: {{ $runbook }}#deathwatchfirewallagentdown
      - alert: DeathwatchFirewallSyncFailing
        expr: increase(deathwatch_firewall_sync_failures_total{ {{- $F -}} }[10m]) > 2
        for: {{ $for.firewallSyncFailing }}
        labels: {severity: warning}
        annotations:
          summary: A firewall agent's syncs keep failing
          description: >-
            The firewall agent {{`{{ $labels.instance }}`}} failed to sync its table
            {{`{{ $value | printf "%.0f" }}`}} times in 10 minutes ({{`{{ $labels.reason }}`}}).
          runbook_url: {{ $runbook }}#deathwatchfirewallsyncfailing
      - alert: DeathwatchFirewallRuleMissing
        expr: deathwatch_firewall_rule_present{ {{- $F -}} } == 0
        for: {{ $for.firewallSyncFailing }}
        labels: {severity: critical}
        annotations:
          summary: A node's firewall table is not in force
          description: >-
            The live table on {{`{{ $labels.instance }}`}} has not matched its rule for
            {{ $for.firewallSyncFailing }}: the sandboxes on that node may be reachable.
          runbook_url: {{ $runbook }}#deathwatchfirewallrulemissing
      - alert: DeathwatchFirewallRuleBypassed
        expr: deathwatch_firewall_rule_bypassed{ {{- $F -}} } == 1
        for: {{ $for.firewallSyncFailing }}
        labels: {severity: critical}
        annotations:
          summary: A host connection to a sandbox's agent port got through the firewall
          description: >-
            The firewall agent on {{`{{ $labels.instance }}`}} connected from its node's host
            to a sandbox's agent port with its table in force, for
            {{ $for.firewallSyncFailing }}: that node's datapath skips the table. Its
            sandboxes read Shielded=False RuleBypassed.
          runbook_url: {{ $runbook }}#deathwatchfirewallrulebypassed
      # audit mode (firewall.mode=audit): what enforcing would refuse. The rollout's question
      # is whether this stays quiet: then nothing legitimate would be refused there
      - alert: DeathwatchFirewallWouldRefuse
        expr: >-
          sum by (namespace, job, instance, port, source)
          (increase(deathwatch_firewall_audited_connections_total{ {{- $F -}} }[{{ $r.auditWindow }}])) > 0
          or sum by (namespace, job, instance, port, source)
          (deathwatch_firewall_audited_connections_total{ {{- $F -}} }
          unless deathwatch_firewall_audited_connections_total{ {{- $F -}} } offset {{ $r.auditWindow }}) > 0
        for: 0m
        labels: {severity: info}
        annotations:
          summary: An auditing firewall saw connections it would refuse
          description: >-
            The firewall agent on {{`{{ $labels.instance }}`}} let through
            {{`{{ $value | printf "%.0f" }}`}} connection(s) to agent port
            {{`{{ $labels.port }}`}} from {{`{{ $labels.source }}`}} sources in
            {{ $r.auditWindow }} that enforcing would refuse. Its log names each source
            ("audit: would refuse").
          runbook_url: {{ $runbook }}#deathwatchfirewallwouldrefuse
      # deaths heard on the node (firewall.exits, ADR 0028): without its observer a node's
      # deaths are still judged, from the kubelet's reports, up to a second later
      - alert: DeathwatchNodeExitsDeaf
        expr: deathwatch_node_exits_runtime_connected{ {{- $F -}} } == 0
        for: {{ $for.nodeExitsDeaf }}
        labels: {severity: warning}
        annotations:
          summary: A node's exits observer cannot read its container runtime
          description: >-
            The exits container on {{`{{ $labels.instance }}`}} has not read its runtime's
            events for {{ $for.nodeExitsDeaf }}: deaths on that node are judged from the
            kubelet's reports, at its next relist (up to a second later), not as they happen.
          runbook_url: {{ $runbook }}#deathwatchnodeexitsdeaf
      - alert: DeathwatchNodeExitDisputed
        expr: >-
          sum by (namespace, job, policy) (max by (namespace, job, shard, policy) (
          increase(deathwatch_node_exit_disputes_total{ {{- $C -}} }[1h]) * {{ $shard }})) > 0
        for: {{ $for.nodeExitDisputed }}
        labels: {severity: info}
        annotations:
          summary: The kubelet told a death heard on the node otherwise
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} Dead verdict(s) of policy
            {{`{{ $labels.policy }}`}} in the last hour rest on an exit heard on the node that
            the kubelet's report then told otherwise (another exit code, an eviction). The
            verdicts stand; each has a NodeExitDisputed Event and status.disputed saying how.
          runbook_url: {{ $runbook }}#deathwatchnodeexitdisputed
  - name: deathwatch.shards
    rules:
      # every slot's writer: the leader of its shard (one shard: the leader); a reshard
      # leaves a slot to nobody for seconds, a shard with no leader for good
      - alert: DeathwatchShardNoLeader
        expr: >-
          64 - sum by (namespace, job) (max by (namespace, job, shard) (deathwatch_shard_owned_slots{ {{- $C -}} })) > 0
          or absent(deathwatch_shard_owned_slots{ {{- $C -}} }) * 64
        for: {{ $for.shardNoLeader }}
        labels: {severity: critical}
        annotations:
          summary: Some sandboxes have no controller writing their verdicts
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} of the 64 slots have no shard leader writing
            them: the sandboxes there are judged (by a standby, or by nobody) but their
            verdicts are not written.
          runbook_url: {{ $runbook }}#deathwatchshardnoleader
  - name: deathwatch.delivery
    rules:
      # the standby keeps what is owed too (levelled by the leader's marks): the smaller of
      # the two replicas' is the leader's, never a standby's that lags it
      - alert: DeathwatchDeliveryBacklog
        expr: >-
          max by (namespace, job, sink) (min by (namespace, job, shard, sink) (
          deathwatch_delivery_oldest_undelivered_seconds{ {{- $C -}} } * {{ $shard }}))
          > {{ $r.deliveryLateSeconds }}
        for: {{ $for.deliveryBacklog }}
        labels: {severity: warning}
        annotations:
          summary: A sink has not received verdicts it is owed
          description: >-
            Sink {{`{{ $labels.sink }}`}} has been owed a transition for
            {{`{{ $value | humanizeDuration }}`}}: its receiver is down, slow or refusing
            connections. Nothing is lost meanwhile (what is owed lives on the verdicts) until
            the sink's maxAgeSeconds.
          runbook_url: {{ $runbook }}#deathwatchdeliverybacklog
      # a replica whose first scrape already counts a refusal (it refused within seconds of
      # starting) shows no increase(): a series above 0 that did not exist 10 minutes ago fires too
      - alert: DeathwatchDeliveryRefused
        expr: >-
          sum by (namespace, job, sink, outcome) (max by (namespace, job, shard, sink, outcome) ((
          increase(deathwatch_delivery_events_total{ {{- $C -}}, outcome=~"refused|expired"}[10m]) > 0
          or (deathwatch_delivery_events_total{ {{- $C -}}, outcome=~"refused|expired"} > 0
          unless deathwatch_delivery_events_total{ {{- $C -}}, outcome=~"refused|expired"} offset 10m))
          * {{ $shard }}))
        for: {{ $for.deliveryRefused }}
        labels: {severity: critical}
        annotations:
          summary: A sink will never get some verdicts
          description: >-
            Sink {{`{{ $labels.sink }}`}}: {{`{{ $value | printf "%.0f" }}`}} events
            {{`{{ $labels.outcome }}`}} in 10 minutes (refused: its receiver answered a 4xx;
            expired: owed past maxAgeSeconds). They are not sent again.
          runbook_url: {{ $runbook }}#deathwatchdeliveryrefused
  - name: deathwatch.ports
    rules:
      - alert: DeathwatchPortUnderPressure
        expr: >-
          sum by (namespace, job, instance) (
          rate(deathwatch_http_refused_total{ {{- $C -}}, reason=~"evicted|busy|head_timeout|handshake|idle"}[5m])
          or rate(deathwatch_firewall_http_refused_total{ {{- $F -}}, reason=~"evicted|busy|head_timeout|handshake|idle"}[5m])
          ) > {{ $r.portPressurePerSecond }}
        for: {{ $for.portPressure }}
        labels: {severity: warning}
        annotations:
          summary: Something holds or floods a deathwatch port
          description: >-
            {{`{{ $labels.instance }}`}} closes {{`{{ $value | printf "%.1f" }}`}}
            connections a second that held it without asking (slowloris) or past its cap.
            Its work and its liveness probe are unaffected by design; its metrics may not be.
          runbook_url: {{ $runbook }}#deathwatchportunderpressure
      - alert: DeathwatchCertificateExpiring
        # a metrics port's serving certificate that nothing renews in time: scrapers that
        # verify it (the chart's monitors: ADR 0043) refuse it once it expires
        expr: >-
          min by (namespace, job, instance) (
          deathwatch_serving_certificate_expiry_timestamp_seconds{ {{- $C -}} }
          or deathwatch_firewall_serving_certificate_expiry_timestamp_seconds{ {{- $F -}} }
          ) - time() < {{ $r.certificateExpiryDays }} * 86400
        for: {{ $for.certificateExpiring }}
        labels: {severity: warning}
        annotations:
          summary: A deathwatch metrics certificate expires soon
          description: >-
            The serving certificate of {{`{{ $labels.instance }}`}} expires in
            {{`{{ $value | humanizeDuration }}`}}. Once it has, a scraper that verifies it
            refuses it, and the alerts that read its metrics go blind.
          runbook_url: {{ $runbook }}#deathwatchcertificateexpiring
{{- end }}

{{/* The alerts about a part the chart can leave out, by that part: a release without it renders
them not at all (they could never fire; a test that they do would be one that cannot fail). */}}
{{- define "deathwatch.rules.parts" -}}
DeathwatchUncoveredNode: firewall
DeathwatchFirewallAgentDown: firewall
DeathwatchFirewallSyncFailing: firewall
DeathwatchFirewallRuleMissing: firewall
DeathwatchFirewallRuleBypassed: firewall
DeathwatchFirewallWouldRefuse: firewall
DeathwatchNodeExitsDeaf: exits
DeathwatchNodeExitDisputed: exits
{{- end }}
