package testnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ServerPorts are the ports every pod serves TCP and UDP on, for IPv4 and
// IPv6. Each answers with one line naming the pod, the protocol, the
// port and the source address the server saw (see [Reply]).
var ServerPorts = []uint16{8080, 8081, 8082}

// EchoPort is the port of every pod's TCP echo server: it copies back
// whatever it receives and keeps the connection open until the client
// closes it.
const EchoPort uint16 = 9000

// Reply is what a server answered (or, for SCTP, what the receiver
// recorded).
type Reply struct {
	// Server is the name of the pod that answered.
	Server string
	// Proto is "tcp", "udp" or "sctp".
	Proto string
	// Port is the server's local port: the service's target port.
	Port uint16
	// Source is the client address the server saw.
	Source netip.AddrPort
	// Token is the UDP datagram the server answered, or the SCTP
	// initiate tag in hex; empty for TCP.
	Token string
}

// String returns the wire form "<server> <proto> <port> <source>
// [<token>]".
func (r Reply) String() string {
	s := fmt.Sprintf("%s %s %d %s", r.Server, r.Proto, r.Port, r.Source)
	if r.Token != "" {
		s += " " + r.Token
	}
	return s
}

// ParseReply parses the wire form written by [Reply.String].
func ParseReply(s string) (Reply, error) {
	f := strings.Fields(s)
	if len(f) < 4 || len(f) > 5 {
		return Reply{}, fmt.Errorf("malformed reply %q", s)
	}
	port, err := strconv.ParseUint(f[2], 10, 16)
	if err != nil {
		return Reply{}, fmt.Errorf("malformed reply %q: %w", s, err)
	}
	src, err := netip.ParseAddrPort(f[3])
	if err != nil {
		return Reply{}, fmt.Errorf("malformed reply %q: %w", s, err)
	}
	r := Reply{Server: f[0], Proto: f[1], Port: uint16(port), Source: src}
	if len(f) == 5 {
		r.Token = f[4]
	}
	return r, nil
}

// servers are the servers of one pod.
type servers struct {
	pod  *Pod
	wg   sync.WaitGroup
	mu   sync.Mutex
	ls   []io.Closer
	conn map[net.Conn]struct{}
	done bool
}

func startServers(p *Pod) (*servers, error) {
	s := &servers{pod: p, conn: map[net.Conn]struct{}{}}
	err := p.Do(func() error {
		for _, fam := range []struct {
			suffix string
			any    net.IP
		}{{"4", net.IPv4zero}, {"6", net.IPv6unspecified}} {
			for _, port := range ServerPorts {
				l, err := net.ListenTCP("tcp"+fam.suffix, &net.TCPAddr{IP: fam.any, Port: int(port)})
				if err != nil {
					return err
				}
				s.serve(l, func() { s.serveName(l, port) })
				u, err := net.ListenUDP("udp"+fam.suffix, &net.UDPAddr{IP: fam.any, Port: int(port)})
				if err != nil {
					return err
				}
				s.serve(u, func() { s.serveUDP(u, port) })
			}
			l, err := net.ListenTCP("tcp"+fam.suffix, &net.TCPAddr{IP: fam.any, Port: int(EchoPort)})
			if err != nil {
				return err
			}
			s.serve(l, func() { s.serveEcho(l) })
			raw, err := net.ListenIP("ip"+fam.suffix+":132", &net.IPAddr{IP: fam.any})
			if err != nil {
				return fmt.Errorf("raw SCTP socket: %w", err)
			}
			s.serve(raw, func() { s.serveSCTP(raw) })
		}
		return nil
	})
	if err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// serve registers c and runs fn in a goroutine.
func (s *servers) serve(c io.Closer, fn func()) {
	s.mu.Lock()
	s.ls = append(s.ls, c)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// retry reports whether an accept or read error is transient: it sleeps
// a little and returns true, or returns false once the servers stopped.
func (s *servers) retry(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done {
		return false
	}
	time.Sleep(10 * time.Millisecond)
	return true
}

func (s *servers) serveName(l *net.TCPListener, port uint16) {
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			if s.retry(err) {
				continue
			}
			return
		}
		r := Reply{Server: s.pod.Name, Proto: "tcp", Port: port, Source: unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort())}
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write([]byte(r.String() + "\n"))
		c.Close()
	}
}

func (s *servers) serveUDP(u *net.UDPConn, port uint16) {
	buf := make([]byte, 2048)
	for {
		n, src, err := u.ReadFromUDPAddrPort(buf)
		if err != nil {
			if s.retry(err) {
				continue
			}
			return
		}
		r := Reply{Server: s.pod.Name, Proto: "udp", Port: port, Source: unmap(src), Token: token(buf[:n])}
		u.WriteToUDPAddrPort([]byte(r.String()+"\n"), src)
	}
}

func (s *servers) serveEcho(l *net.TCPListener) {
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			if s.retry(err) {
				continue
			}
			return
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conn[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			io.Copy(c, c)
			c.Close()
			s.mu.Lock()
			delete(s.conn, c)
			s.mu.Unlock()
		}()
	}
}

func (s *servers) serveSCTP(raw *net.IPConn) {
	buf := make([]byte, 2048)
	for {
		// For IPv4 the IP header is stripped by the net package.
		n, from, err := raw.ReadFromIP(buf)
		if err != nil {
			if s.retry(err) {
				continue
			}
			return
		}
		init, ok := parseSCTPInit(buf[:n])
		if !ok {
			continue
		}
		src, _ := netip.AddrFromSlice(from.IP)
		s.pod.topo().deliverSCTP(init.tag, Reply{
			Server: s.pod.Name,
			Proto:  "sctp",
			Port:   init.dstPort,
			Source: netip.AddrPortFrom(src.Unmap(), init.srcPort),
			Token:  fmt.Sprintf("%08x", init.tag),
		})
	}
}

// stop closes every socket and waits for the server goroutines.
func (s *servers) stop() error {
	s.mu.Lock()
	s.done = true
	ls := s.ls
	s.ls = nil
	for c := range s.conn {
		c.Close()
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(5 * time.Second):
		return errors.New("servers did not stop within 5s")
	}
}

func (p *Pod) topo() *Topology { return p.NS.topo }

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// token keeps the printable, space-free part of a datagram, at most 64
// bytes, so it fits the reply line.
func token(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		if sb.Len() == 64 {
			break
		}
		if c > ' ' && c < 0x7f {
			sb.WriteByte(c)
		}
	}
	return sb.String()
}
