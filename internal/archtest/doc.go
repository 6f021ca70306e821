// Package archtest holds tests of the tree's shape, not of its behaviour:
// which packages may import which (TestFrontEndsImportNoFrontEnd). It has
// no code of its own.
package archtest
