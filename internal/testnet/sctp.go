package testnet

import (
	"encoding/binary"
	"hash/crc32"
)

// SCTP without an SCTP stack: the harness writes an INIT chunk by hand and
// sends it over a raw IPPROTO_SCTP socket; the pods' raw sockets receive
// it. Conntrack and NAT handle SCTP without CONFIG_IP_SCTP, so this checks
// that a dataplane delivers and translates SCTP packets, not that an
// association could be set up.

const (
	sctpCommonHeaderLen = 12
	sctpInitLen         = 20
	sctpChunkInit       = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpChecksum returns the CRC32c of an SCTP packet, computed with the
// checksum field taken as zero (RFC 9260, appendix A).
func sctpChecksum(pkt []byte) uint32 {
	var zero [4]byte
	c := crc32.Update(0, castagnoli, pkt[:8])
	c = crc32.Update(c, castagnoli, zero[:])
	return crc32.Update(c, castagnoli, pkt[12:])
}

// buildSCTPInit returns an SCTP packet (common header and one INIT chunk,
// without IP header) from srcPort to dstPort with the given initiate tag.
func buildSCTPInit(srcPort, dstPort uint16, tag uint32) []byte {
	b := make([]byte, sctpCommonHeaderLen+sctpInitLen)
	be := binary.BigEndian
	be.PutUint16(b[0:], srcPort)
	be.PutUint16(b[2:], dstPort)
	be.PutUint32(b[4:], 0) // verification tag: 0 in a packet carrying INIT
	// b[8:12] checksum, below.
	c := b[sctpCommonHeaderLen:]
	c[0] = sctpChunkInit
	c[1] = 0
	be.PutUint16(c[2:], sctpInitLen)
	be.PutUint32(c[4:], tag)      // initiate tag
	be.PutUint32(c[8:], 65535)    // advertised receiver window
	be.PutUint16(c[12:], 1)       // outbound streams
	be.PutUint16(c[14:], 1)       // inbound streams
	be.PutUint32(c[16:], tag^0x5) // initial TSN
	// The CRC32c goes on the wire in little-endian byte order, as Linux
	// writes it (sctp_compute_cksum returns a __le32).
	binary.LittleEndian.PutUint32(b[8:], sctpChecksum(b))
	return b
}

type sctpInit struct {
	srcPort, dstPort uint16
	tag              uint32
}

// parseSCTPInit parses an SCTP packet whose first chunk is an INIT and
// whose checksum is right. Anything else reports false: an SCTP stack
// would discard a packet with a wrong checksum, and so does the receiver,
// which makes the harness notice if NAT broke the checksum.
func parseSCTPInit(b []byte) (sctpInit, bool) {
	if len(b) < sctpCommonHeaderLen+sctpInitLen {
		return sctpInit{}, false
	}
	if binary.LittleEndian.Uint32(b[8:]) != sctpChecksum(b) {
		return sctpInit{}, false
	}
	be := binary.BigEndian
	c := b[sctpCommonHeaderLen:]
	if c[0] != sctpChunkInit || be.Uint16(c[2:]) < sctpInitLen || be.Uint32(b[4:]) != 0 {
		return sctpInit{}, false
	}
	return sctpInit{srcPort: be.Uint16(b[0:]), dstPort: be.Uint16(b[2:]), tag: be.Uint32(c[4:])}, true
}
