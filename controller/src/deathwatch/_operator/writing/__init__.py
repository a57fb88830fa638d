"""What goes out to the API: the writer (a queue by priority, one write in flight per
object, latest desire wins, fenced by the Lease: `writer`), its write reduction
(`status_writes`), and the calls themselves (`kube`)."""
