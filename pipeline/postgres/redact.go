package postgres

import (
	"errors"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// mask replaces a password wherever a connection string is printed or
// logged; it is the mask pgx and net/url use.
const mask = "xxxxx"

// passwordParams are the connection parameters that hold secrets.
var passwordParams = map[string]bool{"password": true, "sslpassword": true}

// keywordPassword finds password='...' and password=... in a keyword/value
// connection string ("host=db password=secret").
var keywordPassword = regexp.MustCompile(`\b(password|sslpassword)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]*)`)

// Redact returns the connection string with every password in it masked
// (the URL's userinfo password, password and sslpassword parameters), for
// printing and logging. A string that does not parse is masked from the
// first ':' of its userinfo to its last '@': too much rather than too
// little.
func Redact(connString string) string {
	if !isURL(connString) {
		return keywordPassword.ReplaceAllString(connString, "${1}="+mask)
	}
	u, err := url.Parse(connString)
	if err != nil {
		return redactBrokenURL(connString)
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), mask)
	}
	q := u.Query()
	masked := false
	for k := range q {
		if passwordParams[strings.ToLower(k)] {
			q.Set(k, mask)
			masked = true
		}
	}
	if masked {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// secrets returns the passwords in a connection string, as written, so
// that text quoting it can be scrubbed.
func secrets(connString string) []string {
	var out []string
	add := func(s string) {
		if s = strings.Trim(s, "'"); s != "" && s != mask {
			out = append(out, s)
		}
	}
	if !isURL(connString) {
		for _, m := range keywordPassword.FindAllStringSubmatch(connString, -1) {
			add(m[2])
		}
		return out
	}
	rest := connString[strings.Index(connString, "://")+3:]
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if user, pass, ok := strings.Cut(rest[:at], ":"); ok && !strings.Contains(user, "/") {
			add(pass)
			if dec, err := url.PathUnescape(pass); err == nil {
				add(dec)
			}
		}
	}
	if u, err := url.Parse(connString); err == nil {
		for k, vs := range u.Query() {
			if passwordParams[strings.ToLower(k)] {
				for _, v := range vs {
					add(v)
				}
			}
		}
	} else {
		for _, m := range keywordPassword.FindAllStringSubmatch(connString, -1) {
			add(m[2])
		}
	}
	return out
}

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

func redactBrokenURL(s string) string {
	scheme := strings.Index(s, "://") + 3
	rest := s[scheme:]
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
			rest = rest[:colon+1] + mask + rest[at:]
		}
	}
	return s[:scheme] + keywordPassword.ReplaceAllString(rest, "${1}="+mask)
}

// redactedError is an error whose text had a connection string's secrets
// removed; it still unwraps to the original, so errors.Is and errors.As
// (IsUnavailable) keep working.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactError returns err with every secret of connString removed from its
// text. pgx quotes the connection string in its parse errors, masking what
// it recognizes as a password on a best-effort basis (a password with an
// unescaped '@' leaks its tail), so a parse error's text is rebuilt from
// Redact instead.
func redactError(connString string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		reason := pce.Error()
		// "cannot parse `<string>`: <reason>"
		if i := strings.LastIndex(reason, "`: "); i >= 0 {
			reason = reason[i+3:]
		}
		msg = "parse database url " + Redact(connString) + ": " + reason
	}
	scrubbed := msg
	for _, s := range secrets(connString) {
		scrubbed = strings.ReplaceAll(scrubbed, s, mask)
	}
	if scrubbed == err.Error() {
		return err
	}
	return &redactedError{msg: scrubbed, err: err}
}

// PlaintextRemote reports whether connString lets a connection to a server
// that is not on this machine go unencrypted: sslmode disable, allow, or
// prefer (pgx's default, like libpq's), which falls back to plaintext
// whenever the server or a machine in the middle declines TLS. It returns
// the first such host. Unix sockets, localhost and loopback addresses are
// local. A string that does not parse reports nothing: connecting will
// say why.
func PlaintextRemote(connString string) (host string, ok bool) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return "", false
	}
	tries := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	plaintext := false
	for _, f := range tries {
		plaintext = plaintext || f.TLSConfig == nil
	}
	if !plaintext {
		return "", false
	}
	for _, f := range tries {
		if !isLocal(f.Host) {
			return f.Host, true
		}
	}
	return "", false
}

func isLocal(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
