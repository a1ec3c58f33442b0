package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one child process of the control plane, its output going
// to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // its exit status, once done is closed
}

// startProcess starts bin with args, its standard output and error
// appended to logPath. The child gets SIGKILL if the test process dies
// first, so a crashed or timed-out test leaves no control plane behind
// (strictly: if the OS thread that started it exits, which the Go runtime
// does only for a goroutine that exits locked to its thread), and runs in
// a process group of its own, so a terminal's Ctrl-C reaches the test,
// whose cleanup stops it.
func startProcess(name, logPath, bin string, args ...string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "=== %s %s: %s %s\n", time.Now().Format(time.RFC3339Nano), name, bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pid returns the process's ID, or 0 if p is nil or has exited.
func (p *process) pid() int {
	if p == nil || p.exited() {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop sends SIGTERM, waits up to grace for the process to exit, then
// kills it; killed reports that it had to. Stopping an exited process
// does nothing. The error says the process did not even die of SIGKILL.
func (p *process) stop(grace time.Duration) (killed bool, err error) {
	if p.exited() {
		return false, nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return false, nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return true, nil
	case <-time.After(10 * time.Second):
		return true, fmt.Errorf("%s (pid %d) did not die of SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// exitError describes an unexpected exit with the end of the log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited: %v; end of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 40))
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 right now.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// errAddrInUse says a child could not bind its port (another process took
// it between freePorts and the bind): the caller may retry with others.
var errAddrInUse = errors.New("address already in use")
