package postgres

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// DisplayName is how operators see the database a DSN names, in logs, metrics labels and the
// admin API: postgres://user@host:port/database. It is built from the parsed configuration,
// never from the DSN's text, so no spelling of the password (password = s3cret,
// password='two words', a URL's user info or query) can reach it.
func DisplayName(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "postgres://(a DSN that does not parse)"
	}
	return fmt.Sprintf("postgres://%s@%s/%s", cfg.User, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), cfg.Database)
}

// errUnparsableDSN replaces pgx's error for a DSN that does not parse: that error quotes the
// DSN, redacting its password only in the spellings pgx recognises (not `password = s3cret`).
var errUnparsableDSN = errors.New("the DSN does not parse (its text is not shown: it may hold a password); see docs/backends.md for its forms")

// withoutDSN returns err, or errUnparsableDSN when err would quote the DSN.
func withoutDSN(err error) error {
	if _, ok := errors.AsType[*pgconn.ParseConfigError](err); ok {
		return errUnparsableDSN
	}
	return err
}
