"""A handler that cannot even be imported; its message names a path of the build machine."""

raise ImportError("cannot load /srv/build/secret-project/libnative.so: undefined symbol: frob")
