package testimages

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

// The web server images (nginx, httpd, hostnet-nginx) and pause run stand-ins: cube-testregistry's own
// binary, installed as /usr/sbin/nginx, /usr/sbin/httpd-foreground and /pause (the images' commands). What critest looks
// for is what nginx shows: the process name nginx (pidof), its pid in /var/run/nginx.pid, a command line
// with "master process", an HTTP 200 on the port, and for httpd a line naming it in the container's log.
const (
	nginxBin      = "usr/sbin/nginx"
	httpdBin      = "usr/sbin/httpd-foreground"
	pauseBin      = "pause"
	masterProcess = "nginx: master process nginx -g daemon off;"
)

// IsStandIn: argv0 is how an image starts a stand-in (StandIn).
func IsStandIn(argv0 string) bool {
	b := filepath.Base(argv0)
	return b == "nginx" || b == "httpd-foreground" || b == "pause" || strings.HasPrefix(argv0, "nginx: ")
}

// StandIn is the main of the stand-in os.Args[0] names: Pause or WebServer.
func StandIn() error {
	if filepath.Base(os.Args[0]) == "pause" {
		return Pause()
	}
	return WebServer()
}

// Pause is pause's main: it waits for SIGTERM or SIGINT, reaping the children it inherits as a pod's pid 1.
func Pause() error {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return nil
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
	return nil
}

// WebServer is the stand-in's main: it serves "Welcome to $WEB_NAME!" on $WEB_PORT (80) until SIGTERM.
// Started as nginx, it first re-executes itself with nginx's master process title as its command line.
func WebServer() error {
	if filepath.Base(os.Args[0]) == "nginx" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		return syscall.Exec(exe, []string{masterProcess}, os.Environ())
	}
	name, port := os.Getenv("WEB_NAME"), os.Getenv("WEB_PORT")
	if name == "" {
		name = "nginx"
	}
	if port == "" {
		port = "80"
	}
	if err := os.MkdirAll("/var/run", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile("/var/run/nginx.pid", fmt.Appendf(nil, "%d\n", os.Getpid()), 0o644); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	errc := make(chan error, 1)
	go func() {
		errc <- http.ListenAndServe(":"+port, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "<html><body><h1>Welcome to %s!</h1></body></html>\n", name)
		}))
	}()
	fmt.Printf("%s: serving on port %s\n", name, port)
	select {
	case <-sig:
		return nil
	case err := <-errc:
		return fmt.Errorf("%s: %w", name, err)
	}
}
