package shimclient

import (
	"testing"

	"github.com/cube-runtime/cube/shim/podnet"
	api "github.com/cube-runtime/cube/shim/snapshotapi"
)

// TestPolicyAnnotations: the keys are the shim's, and what the shim reads
// back from them is the policy recorded.
func TestPolicyAnnotations(t *testing.T) {
	if AnnotationAllowInternet != podnet.AnnotationAllowInternet || AnnotationAllowOut != podnet.AnnotationAllowOut || AnnotationDenyOut != podnet.AnnotationDenyOut {
		t.Fatal("the annotation keys differ from shim/podnet's")
	}
	no := false
	a := PolicyAnnotations(&api.NetworkPolicy{AllowInternetAccess: &no, AllowOut: []string{"10.0.0.0/8", "1.2.3.4/32"}})
	if a[AnnotationAllowInternet] != "false" || a[AnnotationAllowOut] != "10.0.0.0/8,1.2.3.4/32" || a[AnnotationDenyOut] != "" {
		t.Errorf("annotations: %v", a)
	}
	if a := PolicyAnnotations(nil); a[AnnotationAllowInternet] != "true" || a[AnnotationAllowOut] != "" {
		t.Errorf("open policy: %v", a)
	}
}
