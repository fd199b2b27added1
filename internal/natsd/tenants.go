package natsd

import (
	"crypto/subtle"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// Account is a tenant of a server: a NATS account of its own, whose
// subjects no user of another account sees or reaches (nats-server keeps
// one subject space per account), with its users and its limits.
type Account struct {
	// Name is the account's name, unique on the server: letters, digits,
	// '-' and '_'.
	Name string
	// Users log in to this account. A name is unique on the server.
	Users []User
	// Limits bound what the account's clients may take of the server.
	Limits Limits
}

// Limits are the bounds nats-server enforces on an account; 0 leaves one
// unbounded (the server's own limits still apply).
type Limits struct {
	// Conns is the most connections the account's users hold at once;
	// the server refuses the next one.
	Conns int
	// Subs is the most subscriptions one connection of the account holds.
	Subs int
	// Payload is the largest message, in bytes, a client of the account
	// may publish.
	Payload int
}

// Tenants is a server started by StartTenants, and the accounts it adds and
// removes while the server runs. The users of Config.Users stay in the
// global account. Safe for concurrent use.
//
// The server checks logins through Tenants (a custom authenticator), not
// through its configured users: adding a user to those needs a
// configuration reload, and a reload re-checks every connection, including
// those still between their TCP or TLS handshake and their CONNECT, which
// it then refuses as unauthorized. A rank of one job connecting while
// another job is added would fail. Accounts are registered at run time,
// their limits set as nats-server sets those of an account's JWT.
type Tenants struct {
	*server.Server

	mu       sync.RWMutex
	users    map[string]tenantUser
	accounts map[string][]string // the user names of each account
}

// tenantUser is a login and where it lands.
type tenantUser struct {
	password string
	account  string // "" for the global account
	perms    *server.Permissions
}

// StartTenants runs an embedded NATS server as cfg says, as StartServer
// does, to which AddAccount then adds accounts.
func StartTenants(cfg Config) (*Tenants, error) {
	opts, err := serverOptions(cfg)
	if err != nil {
		return nil, err
	}
	t := &Tenants{users: map[string]tenantUser{}, accounts: map[string][]string{}}
	for _, u := range opts.Users {
		t.users[u.Username] = tenantUser{password: u.Password, perms: u.Permissions}
	}
	opts.Users = nil
	opts.CustomClientAuthentication = authenticator{t}
	if t.Server, err = run(opts); err != nil {
		return nil, err
	}
	return t, nil
}

// authenticator checks the logins of a Tenants' server.
type authenticator struct{ t *Tenants }

// Check lets a client in whose user and password match, into its user's
// account with its permissions. A full account refuses it (the server says
// so to the client).
func (a authenticator) Check(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	a.t.mu.RLock()
	u, ok := a.t.users[o.Username]
	a.t.mu.RUnlock()
	if !ok || subtle.ConstantTimeCompare([]byte(o.Password), []byte(u.password)) != 1 {
		return false
	}
	acc := a.t.GlobalAccount()
	if u.account != "" {
		var err error
		if acc, err = a.t.LookupAccount(u.account); err != nil {
			return false
		}
	}
	c.RegisterUser(&server.User{Username: o.Username, Account: acc, Permissions: u.perms})
	return true
}

// AddAccount adds account a with its users and limits. Its name and its
// users' must be new on the server.
func (t *Tenants) AddAccount(a Account) error {
	if !validAccountName(a.Name) {
		return fmt.Errorf("natsd: account name %q: letters, digits, '-' and '_' only", a.Name)
	}
	users := make(map[string]tenantUser, len(a.Users))
	for _, u := range a.Users {
		su, err := u.serverUser(nil)
		if err != nil {
			return err
		}
		users[u.Name] = tenantUser{password: u.Password, account: a.Name, perms: su.Permissions}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.accounts[a.Name]; ok {
		return fmt.Errorf("natsd: account %s exists", a.Name)
	}
	for name := range users {
		if _, ok := t.users[name]; ok {
			return fmt.Errorf("natsd: user %s exists", name)
		}
	}
	acc, err := t.LookupAccount(a.Name)
	if err != nil {
		if acc, err = t.RegisterAccount(a.Name); err != nil {
			return fmt.Errorf("natsd: account %s: %w", a.Name, err)
		}
	}
	claims := jwt.NewAccountClaims(a.Name)
	claims.Limits.Conn, claims.Limits.Subs, claims.Limits.Payload = limit(a.Limits.Conns), limit(a.Limits.Subs), limit(a.Limits.Payload)
	t.UpdateAccountClaims(acc, claims)
	for name, u := range users {
		t.users[name] = u
		t.accounts[a.Name] = append(t.accounts[a.Name], name)
	}
	return nil
}

// RemoveAccount stops the logins of account name's users. The server keeps
// the account (it has no way to drop one) with the connections it holds:
// remove an account once its clients are gone.
func (t *Tenants) RemoveAccount(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, u := range t.accounts[name] {
		delete(t.users, u)
	}
	delete(t.accounts, name)
}

// limit is a limit as nats-server takes it: -1 for none.
func limit(n int) int64 {
	if n <= 0 {
		return jwt.NoLimit
	}
	return int64(n)
}

func validAccountName(name string) bool {
	if name == "" || name == server.DEFAULT_GLOBAL_ACCOUNT || name == server.DEFAULT_SYSTEM_ACCOUNT {
		return false
	}
	return !strings.ContainsFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	})
}
