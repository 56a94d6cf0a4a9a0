// Command git-http serves the bare git repositories under a directory over git's smart HTTP
// protocol, read-only, on a loopback address: `git http-backend` (git's own CGI program) behind
// net/http/cgi. Flux's source-controller clones with go-git, which speaks smart HTTP (http,
// https and ssh only; no git://, no dumb HTTP).
//
// usage: git-http -listen 127.0.0.1:PORT -root DIR
//
// A repository DIR/NAME.git is served at http://127.0.0.1:PORT/NAME.git. Pushes are refused
// (http.receivepack is off for anonymous users): tests commit to the bare repository directly.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	root := flag.String("root", "", "directory holding the bare repositories (GIT_PROJECT_ROOT)")
	flag.Parse()
	if *root == "" {
		log.Fatal("-root is required")
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		log.Fatal(err)
	}
	git, err := exec.LookPath("git")
	if err != nil {
		log.Fatal("git is not installed: ", err)
	}
	backend := &cgi.Handler{
		Path: git,
		Args: []string{"http-backend"},
		// GIT_HTTP_EXPORT_ALL: serve every repository without a git-daemon-export-ok file.
		Env:    []string{"GIT_PROJECT_ROOT=" + abs, "GIT_HTTP_EXPORT_ALL=1"},
		Stderr: os.Stderr,
	}
	mux := http.NewServeMux()
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Printf("%s %s", r.Method, r.URL.RequestURI())
		// net/http/cgi passes the request's headers as HTTP_* variables: git http-backend takes
		// the protocol version from HTTP_GIT_PROTOCOL, the body's length from CONTENT_LENGTH.
		backend.ServeHTTP(w, r)
	}))
	log.Printf("serving %s on http://%s", abs, *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
