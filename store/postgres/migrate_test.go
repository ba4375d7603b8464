package postgres

import "testing"

// TestMigrationsHaveOneFileEachVersion guards the embedded schema: branches that each add a
// migration can land with one number twice, and the database would then record only one of them.
func TestMigrationsHaveOneFileEachVersion(t *testing.T) {
	all, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("no migrations embedded")
	}
}
