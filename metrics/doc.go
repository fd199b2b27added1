// Package metrics implements the a2a.Observer interface with Prometheus
// collectors (github.com/prometheus/client_golang), so that the core library
// does not depend on Prometheus, and serves them over HTTP for a2ad and the
// demo.
//
// Every series carries the constant labels group and rank. The families, with
// the default namespace "a2a":
//
//	a2a_collective_duration_seconds{op,algo}         histogram, completed collectives
//	a2a_algorithm_selections_total{op,algo}          counter, every collective
//	a2a_errors_total{op,kind}                        counter, failed collectives
//	a2a_sent_bytes_total{peer_class}                 counter, self|local|remote (local: ranks of this host)
//	a2a_received_bytes_total{peer_class}             counter, self|local|remote
//	a2a_counts_exchange_duration_seconds             histogram, completed exchanges
//	a2a_counts_exchange_errors_total{kind}           counter, failed exchanges
//	a2a_membership_size                              gauge, ranks in the group
//	a2a_shrinks_total                                counter, shrinks to the survivors
//	a2a_shrink_lost_ranks_total                      counter, ranks the shrinks left behind
//	a2a_rejected_connections_total                   counter, from the transport
//	a2a_peer_wait_seconds_total{peer}                counter, LastWait summed by LastPeer
//	a2a_peer_last_arrivals_total{peer}               counter, times peer arrived last
//	a2a_peer_sent_bytes_total{peer}                  counter, from the transport (WatchPeerBytes)
//	a2a_peer_received_bytes_total{peer}              counter, from the transport (WatchPeerBytes)
//	a2a_moe_dispatched_tokens_total{expert}          counter
//	a2a_moe_dropped_tokens_total                     counter
//	a2a_moe_dispatch_duration_seconds                histogram
//	a2a_moe_combine_duration_seconds                 histogram
//	a2a_moe_load_imbalance_ratio                     gauge, max/mean tokens per rank
//	a2a_moe_expert_load{expert}                      gauge, estimated rows per dispatch over the group
//	a2a_moe_rank_imbalance                           gauge, max/mean estimated rank load, replicas included
//	a2a_moe_replacements_total                       counter, re-placements of the experts
//	a2a_moe_replace_bytes_total                      counter, expert parameter bytes this rank sent in them
//	a2a_moe_wire_bytes_total{format}                 counter, bytes of the rows dispatched to other ranks on the wire
//	a2a_moe_wire_saved_bytes_total{format}           counter, bytes the wire format saved against the rows' dtype
//
// The kind label is one of invalid_argument, mismatch, peer_lost, aborted,
// timeout, closed and other (see ErrorKind).
//
// A rank wires it up before joining, and serves the registry:
//
//	reg := prometheus.NewRegistry()
//	obs, err := metrics.New(reg, metrics.Options{Group: cfg.Group, Rank: cfg.Rank})
//	...
//	cfg.Observer = obs
//	comm, err := a2a.Join(ctx, cfg)
//	...
//	obs.WatchTransport(func() uint64 { return comm.Stats().Rejected })
//	obs.WatchPeerBytes(comm.Stats) // per-peer bytes: the traffic matrix
//	addr, err := metrics.Serve(ctx, ":9465", reg) // 9465+rank, see deploy/prometheus
//
// The MoE dispatch layer reports its steps with ObserveDispatch and
// ObserveCombine, its rows by rank and wire format with ObserveRows, its
// shared-memory bytes with ObserveSharedTraffic and ObserveSharedPeer, its
// load estimate with ObserveLoad and its re-placements with ObserveReplace.
// The Observer keeps a summary of them that a Comm it observes adds to its
// traffic reports (MoEReport, a2a.MoEReporter), so a2ad serve's live view
// shows the MoE layer.
//
// A control-plane service (a2ad serve) registers RegisterControl (groups
// and their members, a2a_control_*), RegisterControlRejects,
// RegisterControlTraffic: the traffic and wait matrices of every group,
// a2a_control_traffic_*{group,from,to} (with the shared-memory bytes as
// a2a_control_traffic_local_*), the ones its live view draws, and
// RegisterControlMoE: its MoE panel, a2a_control_moe_*{group}, summed over
// the ranks' reports.
//
// deploy/grafana/a2a-dashboard.json charts these families and
// deploy/prometheus/prometheus.yml scrapes them; the package's tests check
// that the dashboard only names families this package exports.
package metrics
