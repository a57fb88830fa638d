{{/*
deathwatch's alerting rules, as Prometheus rule groups: the PrometheusRule (prometheusrule.yaml)
and the plain file monitoring/deathwatch.rules.yaml (hack/render_manifests.py) both come from
here. Each alert's runbook is a section of docs/runbook.md. Both controller replicas judge
every sandbox, so counters they both keep are taken once (max over replicas), never summed.
*/}}
{{- define "deathwatch.rules" -}}
{{- $r := .Values.prometheusRule -}}
{{- $for := $r.for -}}
{{- $runbook := $r.runbookUrl | default (printf "https://github.com/deathwatch-dev/deathwatch/blob/v%s/docs/runbook.md" .Chart.AppVersion) -}}
{{- $fullname := include "deathwatch.fullname" . -}}
{{- $controllerJob := $r.controllerJob | default (printf ".*%s-controller.*" $fullname) -}}
{{- $firewallJob := $r.firewallJob | default (printf ".*%s-firewall.*" $fullname) -}}
groups:
  - name: deathwatch.controller
    rules:
      - alert: DeathwatchControllerDown
        expr: absent(up{job=~{{ $controllerJob | quote }}} == 1)
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
          (sum(deathwatch_leader) or vector(0)) < 1
          and on() count(up{job=~{{ $controllerJob | quote }}} == 1) > 0
        for: {{ $for.noLeader }}
        labels: {severity: critical}
        annotations:
          summary: deathwatch controllers are up but none holds the Lease
          description: >-
            The controller replicas answer, but none has written for {{ $for.noLeader }}:
            verdicts are judged and held, not published.
          runbook_url: {{ $runbook }}#deathwatchnoleader
      - alert: DeathwatchSplitLeadership
        expr: sum(deathwatch_leader) > 1
        for: {{ $for.noLeader }}
        labels: {severity: critical}
        annotations:
          summary: More than one deathwatch replica says it leads
          description: >-
            {{`{{ $value }}`}} replicas report deathwatch_leader 1 for {{ $for.noLeader }}.
          runbook_url: {{ $runbook }}#deathwatchsplitleadership
      - alert: DeathwatchWatchStale
        expr: >-
          time() - max by (instance, resource)
          (deathwatch_watch_stream_activity_timestamp_seconds{resource="pods"})
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
        expr: max by (instance, resource, scope) (deathwatch_watch_not_open) == 1
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
        expr: increase(deathwatch_task_restarts_total[10m]) > 3
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
          sum by (instance, operation, code)
          (rate(deathwatch_api_errors_total{code!~"404|409"}[5m])) > 0.05
        for: {{ $for.apiErrors }}
        labels: {severity: warning}
        annotations:
          summary: deathwatch's API calls keep failing
          description: >-
            {{`{{ $labels.operation }}`}} fails with {{`{{ $labels.code }}`}} on
            {{`{{ $labels.instance }}`}} ({{`{{ $value | printf "%.2f" }}`}}/s).
          runbook_url: {{ $runbook }}#deathwatchapierrors
      - alert: DeathwatchPolicyErrors
        expr: max by (policy) (increase(deathwatch_policy_errors_total[1m])) > 0
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
        expr: max by (resource, code) (increase(deathwatch_writes_refused_total[15m])) > 0
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
        expr: sum by (instance, resource) (rate(deathwatch_write_retries_total[5m])) > 0
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
          histogram_quantile(0.99, sum by (le)
          (rate(deathwatch_verdict_latency_seconds_bucket[10m]))) > {{ $r.verdictLatencySeconds }}
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
          max by (node) (sum by (instance, node)
          (increase(deathwatch_sandbox_deaths_total[5m]))) > {{ $r.deathBurst.perNode }}
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
          max(sum by (instance) (increase(deathwatch_sandbox_deaths_total[5m])))
          > {{ $r.deathBurst.cluster }}
        for: {{ $for.deathBurst }}
        labels: {severity: critical}
        annotations:
          summary: Many sandboxes died across the cluster
          description: >-
            {{`{{ $value | printf "%.0f" }}`}} sandboxes were declared Dead in 5 minutes.
          runbook_url: {{ $runbook }}#deathwatchdeathburst
      - alert: DeathwatchInfrastructureDeathBurst
        expr: >-
          max by (cause) (sum by (instance, cause)
          (increase(deathwatch_sandbox_deaths_total{origin="Infrastructure"}[10m])))
          > {{ $r.deathBurst.infrastructure }}
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
        expr: max by (node) (deathwatch_node_sandboxes{shielded="False"}) > 0
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
        expr: up{job=~{{ $firewallJob | quote }}} == 0
        for: {{ $for.firewallDown }}
        labels: {severity: warning}
        annotations:
          summary: A firewall agent does not answer
          description: >-
            The firewall agent {{`{{ $labels.instance }}`}} has not answered a scrape for
            {{ $for.firewallDown }} (its rule stays in force; its coverage Lease will go stale).
          runbook_url: {{ $runbook }}#deathwatchfirewallagentdown
      - alert: DeathwatchFirewallSyncFailing
        expr: increase(deathwatch_firewall_sync_failures_total[10m]) > 2
        for: {{ $for.firewallSyncFailing }}
        labels: {severity: warning}
        annotations:
          summary: A firewall agent's syncs keep failing
          description: >-
            The firewall agent {{`{{ $labels.instance }}`}} failed to sync its table
            {{`{{ $value | printf "%.0f" }}`}} times in 10 minutes ({{`{{ $labels.reason }}`}}).
          runbook_url: {{ $runbook }}#deathwatchfirewallsyncfailing
      - alert: DeathwatchFirewallRuleMissing
        expr: deathwatch_firewall_rule_present == 0
        for: {{ $for.firewallSyncFailing }}
        labels: {severity: critical}
        annotations:
          summary: A node's firewall table is not in force
          description: >-
            The live table on {{`{{ $labels.instance }}`}} has not matched its rule for
            {{ $for.firewallSyncFailing }}: the sandboxes on that node may be reachable.
          runbook_url: {{ $runbook }}#deathwatchfirewallrulemissing
      - alert: DeathwatchFirewallRuleBypassed
        expr: deathwatch_firewall_rule_bypassed == 1
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
          sum by (instance, port, source)
          (increase(deathwatch_firewall_audited_connections_total[{{ $r.auditWindow }}])) > 0
          or sum by (instance, port, source)
          (deathwatch_firewall_audited_connections_total
          unless deathwatch_firewall_audited_connections_total offset {{ $r.auditWindow }}) > 0
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
        expr: deathwatch_node_exits_runtime_connected == 0
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
          max by (policy) (increase(deathwatch_node_exit_disputes_total{job=~{{ $controllerJob | quote }}}[1h])) > 0
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
          64 - sum(max by (shard) (deathwatch_shard_owned_slots{job=~{{ $controllerJob | quote }}})) > 0
          or absent(deathwatch_shard_owned_slots{job=~{{ $controllerJob | quote }}}) * 64
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
          min by (sink) (deathwatch_delivery_oldest_undelivered_seconds{job=~{{ $controllerJob | quote }}})
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
          max by (sink, outcome) (
          increase(deathwatch_delivery_events_total{job=~{{ $controllerJob | quote }}, outcome=~"refused|expired"}[10m]) > 0
          or (deathwatch_delivery_events_total{job=~{{ $controllerJob | quote }}, outcome=~"refused|expired"} > 0
          unless deathwatch_delivery_events_total{job=~{{ $controllerJob | quote }}, outcome=~"refused|expired"} offset 10m))
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
          sum by (job, instance) (
          rate(deathwatch_http_refused_total{reason=~"evicted|busy|head_timeout|handshake|idle"}[5m])
          or rate(deathwatch_firewall_http_refused_total{reason=~"evicted|busy|head_timeout|handshake|idle"}[5m])
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
{{- end }}
