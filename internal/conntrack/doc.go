// Package conntrack removes stale connection-tracking entries of service
// traffic over netlink.
//
// A UDP "connection" through a service keeps its NAT binding in conntrack
// for as long as the client keeps sending, so a client whose endpoint went
// away would keep sending into the void (the classic five-second DNS
// stall). After every sync the engine hands this package the service
// addresses and the endpoints each may still reach; every flow to a
// service address whose reply comes from anything else is deleted, and
// the client's next packet is load-balanced afresh.
//
// TCP has one such trap too: a SYN sent to a service address before its
// rules existed leaves an unanswered, untranslated entry, and the client's
// retransmissions match it instead of being NATed, for up to two minutes.
// The engine names the TCP addresses it has just programmed, and their
// untranslated SYN_SENT entries are deleted; established TCP flows are
// never touched.
package conntrack
