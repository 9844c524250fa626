// Package kafkacluster runs Apache Kafka itself on this machine, as plain
// JVM processes (no Docker): a KRaft cluster of one node, or three for
// replication, each node a broker and a controller in one process, on
// 127.0.0.1 ports. `make kafka-up`, `make kafka-down` and `make
// kafka-logs` drive it through kafkactl; the tests that need a cluster of
// their own (the chaos harness's real faults) start one with Start.
//
// The broker's jars come from Maven Central through the project's own
// build file, pom.xml next to this file (a pinned 4.x version, its
// command-line tools and a log4j2 binding), and are cached under
// .data/apache-kafka (Fetch). Java 17 runs them.
//
// A cluster of three or more nodes creates every topic, and the consumer
// offsets and transaction state topics, with replication factor 3 and
// min.insync.replicas 2; a smaller one with every node and 1. Topics are
// not created automatically: onceflow creates its own.
//
// # Security
//
// A cluster started with Config.Security serves clients only over
// SASL_SSL: SCRAM-SHA-512 users created when its storage is formatted
// (Apache Kafka's `kafka-storage format --add-scram`), TLS with a CA and a
// node certificate the cluster makes with crypto/x509 (PEM key and trust
// stores; clients trust CAFile). The nodes replicate over the same
// listener as the user "broker"; their controller listener is SSL with
// client certificates, so only a node speaks there. Security.ACLs turns on
// KRaft's StandardAuthorizer, with admin, broker and the nodes'
// certificate as super users: every other user may do only what an ACL
// allows. ClientOpts and Password connect a client as a user; Tool
// authenticates Apache Kafka's tools as admin (ToolConfig).
//
// # Faults
//
// What the tests of real faults need, on *Cluster and *Node:
//
//   - find a victim: Cluster.TxnCoordinator (the node coordinating a
//     processor's transactional id), Cluster.GroupCoordinator,
//     Cluster.Leader (of a topic's partition), Cluster.Controller (the
//     KRaft quorum's leader);
//   - break it: Node.Kill (SIGKILL: a crash), Node.Stop (SIGTERM, a
//     controlled shutdown, SIGKILL after a bound), Node.Pause and
//     Node.Resume (SIGSTOP and SIGCONT: alive but silent past its
//     session, then back);
//   - bring it back: Node.Start (on its storage; it returns once the node
//     serves as a broker again), Cluster.WaitInSync (every partition's
//     replicas in sync), Cluster.RollingRestart (each node stopped and
//     started in turn, the controller last, in sync between them).
//
// Each node's log is Node.LogPath (log4j's kafka.log in its directory);
// Node.Tail returns its end for a failing test.
//
// A cluster started with Config.Detach outlives the process that started
// it (make kafka-up); Open attaches to it from cluster.json in its
// directory, which records the nodes' ports and process ids. Otherwise
// the nodes die with the process that started them.
package kafkacluster
