module github.com/vmsan/vmsan

go 1.26.8
