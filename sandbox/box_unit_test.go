package sandbox

import (
	"testing"
	"time"
)

// Mirror of the box suites' tenant checks at the box source: a tenant's
// idle box serves that tenant's jobs of its class and no one else's, and a
// job no box of its own tenant can take is a miss (here no neutral box is
// ready), never another tenant's box.
func TestBoxOfATenantServesNoOtherTenant(t *testing.T) {
	t.Parallel()
	bx := newBoxes(nil, BoxConfig{})
	acme := &sandbox{id: "box-acme", tenant: "acme", img: fakeImage, class: fakeClass, prepared: time.Now()}
	bx.idle[boxKey{tenant: "acme", class: fakeClass}] = []*sandbox{acme}
	ctx := t.Context()
	if sb := bx.take(ctx, boxKey{tenant: "globex", class: fakeClass}, fakeImage); sb != nil {
		t.Fatalf("globex's job took %s's box %s", sb.tenant, sb.id)
	}
	if sb := bx.take(ctx, boxKey{tenant: "acme", class: fakeBigClass}, fakeImage); sb != nil {
		t.Fatalf("a job of another class took box %s", sb.id)
	}
	if sb := bx.take(ctx, boxKey{tenant: "acme", class: fakeClass}, fakeImage); sb != acme {
		t.Fatalf("acme's job took %v; want its own idle box", sb)
	}
	if bx.hits != 1 || bx.misses != 2 || bx.claims != 0 {
		t.Fatalf("hits %d, misses %d, claims %d; want 1, 2, 0", bx.hits, bx.misses, bx.claims)
	}
}
